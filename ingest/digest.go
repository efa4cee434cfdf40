package ingest

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage"
)

// A usage log partition made since migration 0061 is unique on (tenant_id,
// md5(request_id)::uuid), not on the request_id itself
// (usagelog.RequestDigestSQL). Two different request_ids of one tenant
// with one MD5 digest (never by chance: 2^-128 a pair; only made on
// purpose, MD5 collisions being constructible) cannot both be recorded in
// one such partition. The lookups compare the request_id itself, so the
// second one's pass finds no earlier log, its insert fails with a unique
// violation, and every retry would fail the same way. This tells that case
// from a race (another transaction recording the same request_id, which
// the next pass answers as a duplicate) and refuses the event for what it
// is: 409, problem type request-id-digest-collision, nothing recorded.

// requestDigestIndexSuffix ends the name of every digest index
// (usagelog.addPartition, migration 0061).
const requestDigestIndexSuffix = "_request_digest"

// RequestIDDigestCollisionType is the problem type of an event refused
// because its request_id shares its MD5 digest with another request_id.
const RequestIDDigestCollisionType = "request-id-digest-collision"

// requestIDDigest is usagelog.RequestDigestSQL computed here.
func requestIDDigest(rid string) [16]byte { return md5.Sum([]byte(rid)) }

// digestCollisionSQL reads, in the partition named by the violation, a
// log of the tenant $1 whose request_id has the digest of one of $2 but is
// none of them: one probe of the digest index a request_id.
const digestCollisionSQL = `SELECT request_id FROM %s
	WHERE tenant_id = $1 AND md5(request_id)::uuid = ANY (ARRAY(SELECT md5(r)::uuid FROM unnest($2::text[]) AS r))
		AND request_id <> ALL ($2::text[])
	LIMIT 1`

// digestCollision returns the error of a request_id digest collision in
// g when err is a unique violation of a digest index caused by one (two
// request_ids of g with one digest, or one of g with the digest of a log
// already recorded in that partition); otherwise err as it is.
func (s *Service) digestCollision(ctx context.Context, g *group, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || !strings.HasSuffix(pgErr.ConstraintName, requestDigestIndexSuffix) {
		return err
	}
	seen := map[[16]byte]string{}
	var rids []string
	for _, ev := range g.events {
		if ev.RequestID == nil {
			continue
		}
		rid := *ev.RequestID
		d := requestIDDigest(rid)
		if other, ok := seen[d]; ok && other != rid {
			return collisionError(rid, other)
		}
		seen[d] = rid
		rids = append(rids, rid)
	}
	var other string
	qerr := s.pool.QueryRow(ctx, fmt.Sprintf(digestCollisionSQL, pgx.Identifier{pgErr.SchemaName, pgErr.TableName}.Sanitize()),
		g.tenantID, rids).Scan(&other)
	if errors.Is(qerr, pgx.ErrNoRows) {
		return err // a race: the next pass finds the winner's log
	}
	if qerr != nil {
		return fmt.Errorf("%w (and reading whether a request_id digest collides: %v)", err, qerr)
	}
	d := requestIDDigest(other)
	return collisionError(seen[d], other)
}

// collisionError refuses rid, whose digest is other's.
func collisionError(rid, other string) *overage.Error {
	return overage.Errorf(overage.ECONFLICT, RequestIDDigestCollisionType,
		"request_id %q has the same MD5 digest as request_id %q of this tenant, and usage logs are unique by that digest: "+
			"it cannot be recorded; send the event under another request_id (nothing of this request was recorded)", rid, other)
}
