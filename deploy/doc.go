// Package deploy holds what runs beside overage in production: Prometheus
// alert rules with their unit tests (prometheus/) and a Grafana dashboard
// (grafana/). Its tests check them against promtool and against the
// metrics the binary exports.
package deploy
