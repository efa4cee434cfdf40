// Package clientstest runs the Python and TypeScript clients' test suites
// (clients/python, clients/typescript) from `go test`, so `make test` runs
// them: their unit tests and the shared retry cases against scripted
// servers, and their live tests against a real `overage serve` on a fresh
// database, directly and through a proxy that loses answers. A machine
// without python3 or node gets them from Debian's packages first.
package clientstest
