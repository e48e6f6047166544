package group

import "testing"

// Example names the last three pool tokens by label (tok-177 …).
func TestExampleTokensAreReserved(t *testing.T) {
	if poolSize-3 != 177 {
		t.Fatalf("Example uses tok-177…179 but the pool has %d tokens", poolSize)
	}
}
