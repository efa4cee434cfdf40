package ingest

// CanonicalJSON is canonicalJSON, for the HTTP fuzz target's oracle.
var CanonicalJSON = canonicalJSON
