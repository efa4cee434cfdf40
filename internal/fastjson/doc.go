// Package fastjson holds ingest's hand-written JSON paths, each behind one
// function: the RFC 8785 canonical form of a body (Canonical), the parser
// of the usage events honest clients send (ParseEvent, ParseBatch) and the
// writer of ingest's answers (RenderLog, RenderBatch).
//
// Each does what encoding/json would, faster (docs/benchmarks.md has the
// measurements), and keeps one contract: it answers ok only for input it
// fully understands, and otherwise the encoding/json path answers —
// Canonical's own decoder path, ingest's event decoder, json.Marshal — so
// every refusal is worded in one place. Fuzz targets hold each to its
// encoding/json reference: FuzzCanonicalJSON and FuzzRenderString here,
// ingest's FuzzFastParse beside the event decoder it agrees with.
package fastjson
