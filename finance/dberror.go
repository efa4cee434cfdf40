package finance

import "github.com/overage-billing/overage/internal/dberr"

func dbError(err error) error {
	return dberr.Classify(err, "the billing database is unreachable; retry later")
}
