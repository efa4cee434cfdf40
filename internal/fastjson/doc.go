// Package fastjson holds ingest's hand-written JSON paths: the RFC 8785
// canonical form of a body (Canonical), the parser of the usage events
// honest clients send (ParseEvent, ParseBatch) and the writer of ingest's
// answers (AppendLogAnswer, AppendBatchAnswer).
//
// Each is an optimisation of what encoding/json does, measured on serve's
// CPU (docs/fast-json.md), and each keeps the same contract: it answers ok
// only for input it fully understands, and the caller takes the
// encoding/json path otherwise, so every refusal is worded in one place.
// Fuzz targets hold each to its encoding/json reference.
package fastjson
