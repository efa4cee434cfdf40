// Package testkit groups the helpers that exist for tests and for the
// development build (`overage dev`), never for the production binary
// (TestProductionBinaryCarriesNoTestKit checks it): a fake clock, a
// flaky HTTP proxy, a goroutine-safe buffer, a throwaway PostgreSQL in
// Docker, and the installer of the commands some tests need. The test
// servers and worlds with a `test` suffix (internal/apitest, worktest,
// billingtest, pgtest) are test-only too.
package testkit
