package ingest

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// pgArray is a one-dimensional array argument whose Index answers a pointer
// to the element. pgx encodes an array element by element through Index,
// which returns any: a []time.Time or []int64 boxes (allocates) every
// element, a pointer is boxed for free. The element types implement the
// valuer interface of their PostgreSQL type, so pgx encodes them without
// reflection. TestPgArrayEncodesAsSlices checks the bytes are the slices'.
type pgArray[T any] []T

func (a pgArray[T]) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

func (a pgArray[T]) Index(i int) any { return &a[i] }

func (a pgArray[T]) IndexType() any { return new(T) }

// pgTimestamptz is a timestamptz array element.
type pgTimestamptz time.Time

func (t *pgTimestamptz) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: time.Time(*t), Valid: true}, nil
}

// pgInt8 is a bigint array element.
type pgInt8 int64

func (n *pgInt8) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*n), Valid: true}, nil
}

// pgString is a text array element.
type pgString string

func (s *pgString) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*s), Valid: true}, nil
}
