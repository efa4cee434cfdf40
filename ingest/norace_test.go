//go:build !race

package ingest_test

// raceDetector: the race detector makes the code 5 to 10 times slower.
const raceDetector = false
