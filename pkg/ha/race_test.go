//go:build race

package ha

// raceDetector is true in a -race build: the heaviest tests scale down.
const raceDetector = true
