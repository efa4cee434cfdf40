// Package pgplan holds the planner settings that transactions open with to
// keep their plans on indexes whatever the statistics.
package pgplan

// NoSeqScan is two set_config calls (for a SELECT list; transaction-local)
// that turn sequential scans off and JIT with them. A scan turned off is
// not forbidden, only costed at 10^10, so a statement that must still scan
// (a table with no index for it) gets a plan costed far above
// jit_above_cost, and PostgreSQL would then compile it with LLVM at every
// execution: the finance totals, which run in 6 ms, spent 93 ms compiling
// (docs/plans.md, "JIT where a scan is turned off"). No statement run
// under these settings repays compiling.
const NoSeqScan = `set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)`

// NoSeqScanColumns is how many columns NoSeqScan selects.
const NoSeqScanColumns = 2
