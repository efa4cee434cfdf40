// Command insertsql prints usagelog.InsertSQL, for bench/metersinsert.py
// to run it in psql.
package main

import (
	"fmt"

	"github.com/overage-billing/overage/usagelog"
)

func main() { fmt.Print(usagelog.InsertSQL) }
