package ingest

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestPgArrayEncodesAsSlices: the pointer-element arrays are sent as the
// very bytes pgx writes for the slices they replace, in the binary format
// the ingest statements use, NULL request_ids included.
func TestPgArrayEncodesAsSlices(t *testing.T) {
	t.Parallel()
	m := pgtype.NewMap()
	ts := []time.Time{time.Date(2026, 11, 30, 10, 0, 0, 123456000, time.UTC), time.Date(1999, 1, 1, 0, 0, 0, 0, time.FixedZone("", 3600)), {}}
	ids := []uuid.UUID{uuid.New(), uuid.Nil, uuid.New()}
	rid := "r-1"
	cases := []struct {
		name     string
		oid      uint32
		old, new any
	}{
		{"timestamptz", pgtype.TimestamptzArrayOID, ts, pgArray[pgTimestamptz]{pgTimestamptz(ts[0]), pgTimestamptz(ts[1]), pgTimestamptz(ts[2])}},
		{"bigint", pgtype.Int8ArrayOID, []int64{0, -1, 1 << 40, 1<<63 - 1}, pgArray[pgInt8]{0, -1, 1 << 40, 1<<63 - 1}},
		{"text", pgtype.TextArrayOID, []string{"", "gpt-4o", "é\x00"}, pgArray[pgString]{"", "gpt-4o", "é\x00"}},
		{"nullable text", pgtype.TextArrayOID, []*string{&rid, nil}, pgArray[pgtype.Text]{{String: rid, Valid: true}, {}}},
		{"uuid", pgtype.UUIDArrayOID, ids, pgArray[pgtype.UUID]{pgUUID(ids[0]), pgUUID(ids[1]), pgUUID(ids[2])}},
		{"empty", pgtype.Int8ArrayOID, []int64{}, pgArray[pgInt8]{}},
	}
	for _, c := range cases {
		want, err := m.Encode(c.oid, pgtype.BinaryFormatCode, c.old, nil)
		if err != nil {
			t.Fatalf("%s: encode the slice: %v", c.name, err)
		}
		got, err := m.Encode(c.oid, pgtype.BinaryFormatCode, c.new, nil)
		if err != nil {
			t.Fatalf("%s: encode the pgArray: %v", c.name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: pgArray encodes as %x, the slice as %x", c.name, got, want)
		}
	}
}

// BenchmarkPgArrayEncode: the encoding of a batch's 1,000-element
// arguments, as slices and as pgArrays.
func BenchmarkPgArrayEncode(b *testing.B) {
	m := pgtype.NewMap()
	const n = 1000
	ts, pts := make([]time.Time, n), make(pgArray[pgTimestamptz], n)
	ints, pints := make([]int64, n), make(pgArray[pgInt8], n)
	strs, pstrs := make([]string, n), make(pgArray[pgString], n)
	for i := range n {
		ts[i] = time.Now().Add(time.Duration(i) * time.Second)
		pts[i] = pgTimestamptz(ts[i])
		ints[i], pints[i] = int64(1000+i), pgInt8(1000+i)
		strs[i], pstrs[i] = "gpt-4o", "gpt-4o"
	}
	for _, c := range []struct {
		name string
		oid  uint32
		v    any
	}{
		{"timestamptz/slice", pgtype.TimestamptzArrayOID, ts}, {"timestamptz/pgArray", pgtype.TimestamptzArrayOID, pts},
		{"bigint/slice", pgtype.Int8ArrayOID, ints}, {"bigint/pgArray", pgtype.Int8ArrayOID, pints},
		{"text/slice", pgtype.TextArrayOID, strs}, {"text/pgArray", pgtype.TextArrayOID, pstrs},
	} {
		b.Run(c.name, func(b *testing.B) {
			var buf []byte
			for b.Loop() {
				var err error
				if buf, err = m.Encode(c.oid, pgtype.BinaryFormatCode, c.v, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
