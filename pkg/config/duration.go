package config

import (
	"fmt"
	"strconv"
	"time"
)

// Duration is a time.Duration written in the file as a string with a unit,
// such as "60s", "5m" or "2160h". The zero Duration means unset: a key
// written as "0s" is rejected when the file is parsed, so zero never
// silently stands for a default.
type Duration time.Duration

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// IsSet reports whether d is set (not zero).
func (d Duration) IsSet() bool { return d != 0 }

// String formats d in the largest unit that represents it exactly, so that
// 60s prints as "1m" and 90 days as "2160h".
func (d Duration) String() string {
	v := int64(d)
	if v == 0 {
		return "0s"
	}
	units := []struct {
		name string
		size int64
	}{
		{"h", int64(time.Hour)},
		{"m", int64(time.Minute)},
		{"s", int64(time.Second)},
		{"ms", int64(time.Millisecond)},
		{"us", int64(time.Microsecond)},
	}
	for _, u := range units {
		if v%u.size == 0 {
			return strconv.FormatInt(v/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(v, 10) + "ns"
}

// MarshalText writes d as String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a duration in time.ParseDuration's syntax.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q: want a string with a unit, like \"60s\" or \"5m\"", b)
	}
	*d = Duration(v)
	return nil
}
