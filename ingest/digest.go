package ingest

import (
	"context"
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

// digestCollisionSQL finds, among the request_ids $2 of the tenant $1,
// two with one digest, or one whose digest is that of another request_id
// recorded in the partition named by the violation (one probe of its
// digest index a request_id): the request_id of the request first, the
// other second. The digest is computed by the database, as its index does.
const digestCollisionSQL = `WITH r AS (SELECT DISTINCT rid FROM unnest($2::text[]) AS r (rid) WHERE rid IS NOT NULL)
	(SELECT max(rid), min(rid) FROM r GROUP BY md5(rid)::uuid HAVING count(*) > 1 LIMIT 1)
	UNION ALL
	(SELECT r.rid, l.request_id FROM r CROSS JOIN LATERAL (
		SELECT l.request_id FROM %s l
		WHERE l.tenant_id = $1 AND md5(l.request_id)::uuid = md5(r.rid)::uuid AND l.request_id <> r.rid LIMIT 1) AS l
	LIMIT 1)
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
	var rids []string
	for _, ev := range g.events {
		if ev.RequestID != nil {
			rids = append(rids, *ev.RequestID)
		}
	}
	var rid, other string
	qerr := s.pool.QueryRow(ctx, fmt.Sprintf(digestCollisionSQL, pgx.Identifier{pgErr.SchemaName, pgErr.TableName}.Sanitize()),
		g.tenantID, rids).Scan(&rid, &other)
	if errors.Is(qerr, pgx.ErrNoRows) {
		return err // a race: the next pass finds the winner's log
	}
	if qerr != nil {
		return fmt.Errorf("%w (and reading whether a request_id digest collides: %v)", err, qerr)
	}
	return overage.Errorf(overage.ECONFLICT, RequestIDDigestCollisionType,
		"request_id %q has the same MD5 digest as request_id %q of this tenant, and usage logs are unique by that digest: "+
			"it cannot be recorded; send the event under another request_id (nothing of this request was recorded)", rid, other)
}
