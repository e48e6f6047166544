package group

import "testing"

// Example names the last three pool tokens by label (tok-117 …).
func TestExampleTokensAreReserved(t *testing.T) {
	if poolSize-3 != 117 {
		t.Fatalf("Example uses tok-117…119 but the pool has %d tokens", poolSize)
	}
}
