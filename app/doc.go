// Package app wires overage's parts the one way every entry point uses:
// the configuration and its defaults (Config), the database pools, the HTTP
// API of `overage serve` (Server), the River workers of `overage work`
// (NewWorkers), and the metrics registry. The commands, `overage dev` and
// the tests call these constructors, so what a test runs is what ships.
package app
