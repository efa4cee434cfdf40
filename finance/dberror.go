package finance

import "github.com/overage-billing/overage/internal/dberr"

// dbError classifies a failure of the finance reads. A sum out of range
// there is no fault of the caller's input: it stays internal (500).
func dbError(err error) error {
	if dberr.IsOverflow(err) {
		return err
	}
	return dberr.Classify(err, "the billing database is unreachable; retry later")
}
