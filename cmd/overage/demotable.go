//go:build dev

package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/stripeclient/emulator"
)

// The demo's closing tables. Each is rows built by a small function from
// counts, so that a table reads as a sum: its first part, "+ " parts, and
// "= " their total (TestDevDemoTablesAddUp adds them up). A new meter is a
// new entry in the meters meterRows is given.

// tableRow is one line of a table: left-aligned cells, right-aligned
// numbers, and a note.
type tableRow struct {
	left []string
	nums []string
	note string
}

// writeRows writes rows as aligned columns: the first row is the table's
// title or header, the others are indented.
func writeRows(w io.Writer, rows []tableRow) {
	var leftW, numW []int
	widen := func(ws *[]int, i, n int) {
		for len(*ws) <= i {
			*ws = append(*ws, 0)
		}
		(*ws)[i] = max((*ws)[i], n)
	}
	for i, r := range rows {
		for j, c := range r.left {
			if j == 0 && i > 0 {
				c = "  " + c
			}
			widen(&leftW, j, len([]rune(c)))
		}
		for j, c := range r.nums {
			widen(&numW, j, len([]rune(c)))
		}
	}
	for i, r := range rows {
		var b strings.Builder
		for j := range leftW {
			c := ""
			if j < len(r.left) {
				c = r.left[j]
			}
			if j == 0 && i > 0 {
				c = "  " + c
			}
			if j > 0 {
				b.WriteString("  ")
			}
			b.WriteString(c + strings.Repeat(" ", leftW[j]-len([]rune(c))))
		}
		for j := range numW {
			c := ""
			if j < len(r.nums) {
				c = r.nums[j]
			}
			b.WriteString("  " + strings.Repeat(" ", numW[j]-len([]rune(c))) + c)
		}
		if r.note != "" {
			b.WriteString("   " + r.note)
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// requestRows: the requests the client made, by why it made them.
// httpRequests is what reached the API; any it made beyond the demo's
// sends and the resends of lost answers are retries of a 429 or 5xx.
func requestRows(events, replays, duplicates, lost, httpRequests int64) []tableRow {
	rows := []tableRow{
		{left: []string{"Requests to the API"}, nums: []string{"requests"}},
		{left: []string{"first sends, one per event"}, nums: []string{thousands(events)}},
		{left: []string{"+ sent again under the same Idempotency-Key"}, nums: []string{thousands(replays)}, note: "answered with the stored answer: nothing stored twice"},
		{left: []string{"+ sent again under a new key"}, nums: []string{thousands(duplicates)}, note: "its request_id was stored: answered as a duplicate"},
		{left: []string{"+ resent after the network lost the answer"}, nums: []string{thousands(lost)}, note: "the server had committed: the resend got the stored answer"},
	}
	if other := httpRequests - events - replays - duplicates - lost; other != 0 {
		rows = append(rows, tableRow{left: []string{"+ retried after a 429 or 5xx answer"}, nums: []string{thousands(other)}})
	}
	return append(rows, tableRow{left: []string{"= requests that reached the API"}, nums: []string{thousands(httpRequests)}})
}

// logRows: this run's usage logs per tenant, by billing status.
func logRows(ts []demoTenant, logs runLogs) []tableRow {
	header := tableRow{left: []string{"Usage logs of this run"}}
	for _, t := range ts {
		header.nums = append(header.nums, t.name)
	}
	header.nums = append(header.nums, "all")
	row := func(label, note string, statuses ...string) tableRow {
		r := tableRow{left: []string{label}, note: note}
		var all int64
		for _, t := range ts {
			var n int64
			for _, s := range statuses {
				n += logs[t.id][s]
			}
			all += n
			r.nums = append(r.nums, thousands(n))
		}
		r.nums = append(r.nums, thousands(all))
		return r
	}
	rows := []tableRow{header,
		row("billed", "its overage accepted by Stripe", string(overage.BillingStatusBilled)),
		row("+ within the allowance", "no overage: nothing to bill", string(overage.BillingStatusNotBillable)),
		row("+ pending", "not billed yet", string(overage.BillingStatusPending)),
	}
	for _, s := range []string{string(overage.BillingStatusNeedsReview), string(overage.BillingStatusFailed)} {
		if logs.total(s) > 0 {
			rows = append(rows, row("+ "+strings.ReplaceAll(s, "_", " "), "", s))
		}
	}
	all := []string{string(overage.BillingStatusBilled), string(overage.BillingStatusNotBillable), string(overage.BillingStatusPending),
		string(overage.BillingStatusNeedsReview), string(overage.BillingStatusFailed)}
	return append(rows, row("= stored, one per event", "", all...))
}

// callOutcomes label the emulator's outcomes of a meter-event call, in the
// order the table lists them; an outcome not here is listed by its name.
var callOutcomes = []struct{ outcome, label, note string }{
	{emulator.OutcomeLostResponse, "+ applied, answer lost (injected: %s of those applied)", "the worker resent it under the same idempotency key"},
	{emulator.OutcomeReplayed, "+ resends answered with the saved answer", "Stripe's idempotency: not applied again"},
	{emulator.OutcomeFaultServerError, "+ 500 before applying (injected: %s)", "nothing applied; sent again"},
	{emulator.OutcomeFaultRateLimit, "+ 429 before applying (injected: %s)", "nothing applied; sent again"},
	{emulator.OutcomeConcurrentRateLimit, "+ 429: another call for the customer and meter in flight", "nothing applied; sent again"},
	{emulator.OutcomeRateLimited, "+ 429: over the account's calls per second", "nothing applied; sent again"},
	{emulator.OutcomeKeyInUse, "+ 409: the same idempotency key in flight", "nothing applied; sent again"},
	{emulator.OutcomeClientGone, "+ abandoned by the worker before applying", "nothing applied"},
	{emulator.OutcomeAlreadyExists, "+ refused: the identifier was applied before", "not applied again"},
}

// callRows: the meter-event calls Stripe got, by outcome, and the events
// it applied. The injected faults are always listed, even when none
// happened; other outcomes when they did.
func callRows(calls map[string]int64, f emulator.Faults, applied int64) []tableRow {
	rows := []tableRow{
		{left: []string{"Calls to Stripe (the emulator)"}, nums: []string{"calls"}},
		{left: []string{"applied and answered"}, nums: []string{thousands(calls[emulator.OutcomeApplied])}},
	}
	injected := map[string]float64{
		emulator.OutcomeLostResponse: f.LostResponseRate, emulator.OutcomeFaultServerError: f.ServerErrorRate, emulator.OutcomeFaultRateLimit: f.RateLimitRate,
	}
	listed := map[string]bool{emulator.OutcomeApplied: true}
	var total int64
	for _, n := range calls {
		total += n
	}
	for _, o := range callOutcomes {
		listed[o.outcome] = true
		rate, isFault := injected[o.outcome]
		if calls[o.outcome] == 0 && !(isFault && rate > 0) {
			continue
		}
		label := o.label
		if strings.Contains(label, "%s") {
			label = fmt.Sprintf(label, pct(rate))
		}
		rows = append(rows, tableRow{left: []string{label}, nums: []string{thousands(calls[o.outcome])}, note: o.note})
	}
	var rest []string
	for o := range calls {
		if !listed[o] {
			rest = append(rest, o)
		}
	}
	slices.Sort(rest)
	for _, o := range rest {
		rows = append(rows, tableRow{left: []string{"+ " + strings.ReplaceAll(o, "_", " ")}, nums: []string{thousands(calls[o])}})
	}
	rows = append(rows, tableRow{left: []string{"= calls"}, nums: []string{thousands(total)}})
	answered, lost := calls[emulator.OutcomeApplied], calls[emulator.OutcomeLostResponse]
	rows = append(rows, tableRow{left: []string{"meter events applied"}, nums: []string{thousands(applied)},
		note: fmt.Sprintf("= %s answered + %s whose answer was lost", thousands(answered), thousands(lost))})
	return rows
}

// meterRows: per tenant and meter, the overage tokens the database holds
// as billed and what Stripe applied, and whether every row agrees.
func meterRows(ts []demoTenant, meters []string, billed, applied map[emulator.AppliedKey]int64) ([]tableRow, bool) {
	rows := []tableRow{{left: []string{"Overage tokens", "meter"}, nums: []string{"billed (database)", "applied (Stripe)", "agree"}}}
	ok := true
	for _, t := range ts {
		for _, m := range meters {
			k := emulator.AppliedKey{Customer: t.customer, EventName: m}
			agree := billed[k] == applied[k]
			ok = ok && agree
			rows = append(rows, tableRow{left: []string{t.name, m}, nums: []string{thousands(billed[k]), thousands(applied[k]), yesNo(agree)}})
		}
	}
	// Stripe holding usage of a customer or meter the table does not list
	// is a disagreement too.
	for k, v := range applied {
		if v != 0 && (!slices.ContainsFunc(ts, func(t demoTenant) bool { return t.customer == k.Customer }) || !slices.Contains(meters, k.EventName)) {
			ok = false
		}
	}
	return rows, ok
}

// plural is n and the noun in the form n takes: "1 event", "2 events".
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return thousands(n) + " " + many
}

// thousands formats n with commas between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// pct formats a rate in [0, 1] as a percentage: 0.1 is "10%".
func pct(rate float64) string {
	return strconv.FormatFloat(rate*100, 'f', -1, 64) + "%"
}
