// Package testkit groups the helpers that exist for tests and for the
// development build (`overage dev`), never for the production binary
// (TestProductionBinaryCarriesNoTestKit checks it): a fake clock, a
// flaky HTTP proxy, a goroutine-safe buffer, a throwaway PostgreSQL in
// Docker, the installer of the commands some tests need, and the test
// servers, worlds and waits with a `test` suffix (apitest, worktest,
// billingtest, pgtest, polltest, metricstest) and jsonvalue, the fuzz
// targets' oracle of JSON equality.
package testkit
