package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/usagelog"
)

// A usage log partition is unique by a digest, not by the request_id
// itself: since migration 0067 by the digest of tenant and request_id
// (usagelog.RequestKeySQL), from 0061 by (tenant_id, md5(request_id)::uuid)
// (usagelog.RequestDigestSQL). Two different request_ids with one digest
// (never by chance: 2^-128 a pair; only made on purpose, MD5 collisions
// being constructible) cannot both be recorded in one such partition. The
// lookups compare the tenant and the request_id themselves, so the second
// one's pass finds no earlier log, its insert fails with a unique
// violation, and every retry would fail the same way. This tells that case
// from a race (another transaction recording the same request_id, which
// the next pass answers as a duplicate) and refuses the event for what it
// is: 409, problem type request-id-digest-collision, nothing recorded.
//
// Under 0067's index the other pair may be another tenant's (the digest
// covers the tenant): it is then not named. Making one on purpose would
// take a second preimage of MD5 under that tenant's id and a request_id
// one does not know (a constructed collision's two inputs are both one's
// own), as for the idempotency keys (idempotency.KeyDigest).

// RequestIDDigestCollisionType is the problem type of an event refused
// because its request_id shares its MD5 digest with another request_id.
const RequestIDDigestCollisionType = "request-id-digest-collision"

// digestCollisionSQL finds, among the request_ids $2 of the tenant $1,
// two with one digest, or one whose digest is that of another request_id
// recorded in the partition named by the violation (one probe of its
// digest index a request_id): the request_id of the request first, the
// other second (NULL: another tenant's). The digest is computed by the
// database, as its index does: %[1]s is the partition, %[2]s the digest
// of the request_id r.rid, %[3]s the condition that the log l has that
// digest and is another tenant's or request_id.
const digestCollisionSQL = `WITH r AS (SELECT DISTINCT rid FROM unnest($2::text[]) AS r (rid) WHERE rid IS NOT NULL)
	(SELECT max(rid), min(rid) FROM r GROUP BY %[2]s HAVING count(*) > 1 LIMIT 1)
	UNION ALL
	(SELECT r.rid, l.request_id FROM r CROSS JOIN LATERAL (
		SELECT CASE WHEN l.tenant_id = $1 THEN l.request_id END AS request_id FROM %[1]s l
		WHERE %[3]s LIMIT 1) AS l
	LIMIT 1)
	LIMIT 1`

// collisionSQL is digestCollisionSQL of the partition table whose unique
// index index was violated; ok false for an index not on a digest.
func collisionSQL(index, table string) (query string, ok bool) {
	switch {
	case strings.HasSuffix(index, usagelog.RequestKeyIndexSuffix): // since 0067
		key := usagelog.RequestKey("$1::uuid", "r.rid")
		return fmt.Sprintf(digestCollisionSQL, table, key,
			usagelog.RequestKey("l.tenant_id", "l.request_id")+" = "+key+" AND (l.tenant_id <> $1 OR l.request_id <> r.rid)"), true
	case strings.HasSuffix(index, usagelog.RequestDigestIndexSuffix): // from 0061
		return fmt.Sprintf(digestCollisionSQL, table, "md5(r.rid)::uuid",
			"l.tenant_id = $1 AND md5(l.request_id)::uuid = md5(r.rid)::uuid AND l.request_id <> r.rid"), true
	}
	return "", false
}

// digestCollision returns the error of a request_id digest collision in
// g when err is a unique violation of a digest index caused by one (two
// request_ids of g with one digest, or one of g with the digest of a log
// already recorded in that partition); otherwise err as it is.
func (s *Service) digestCollision(ctx context.Context, g *group, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return err
	}
	query, ok := collisionSQL(pgErr.ConstraintName, pgx.Identifier{pgErr.SchemaName, pgErr.TableName}.Sanitize())
	if !ok {
		return err
	}
	var rids []string
	for _, ev := range g.events {
		if ev.RequestID != nil {
			rids = append(rids, *ev.RequestID)
		}
	}
	var rid string
	var other *string
	qerr := s.pool.QueryRow(ctx, query, g.tenantID, rids).Scan(&rid, &other)
	if errors.Is(qerr, pgx.ErrNoRows) {
		return err // a race: the next pass finds the winner's log
	}
	if qerr != nil {
		return fmt.Errorf("%w (and reading whether a request_id digest collides: %v)", err, qerr)
	}
	if other == nil {
		return overage.Errorf(overage.ECONFLICT, RequestIDDigestCollisionType,
			"request_id %q has, with this tenant's id, the same MD5 digest as a request_id of another tenant, and usage logs are unique by that digest: "+
				"it cannot be recorded; send the event under another request_id (nothing of this request was recorded)", rid)
	}
	return overage.Errorf(overage.ECONFLICT, RequestIDDigestCollisionType,
		"request_id %q has the same MD5 digest as request_id %q of this tenant, and usage logs are unique by that digest: "+
			"it cannot be recorded; send the event under another request_id (nothing of this request was recorded)", rid, *other)
}
