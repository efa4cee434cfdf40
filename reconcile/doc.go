// Package reconcile compares what PostgreSQL holds as billed with what
// Stripe reports having received, per customer, meter and UTC day — the
// check behind `overage reconcile --from DAY --to DAY [--tenant ID]`.
//
// The design behind it is in docs/reconcile.md.
package reconcile
