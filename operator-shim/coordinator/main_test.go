package coordinator

import (
	"os"
	"testing"
)

// Every cycle of every test checks its incremental write diff against a
// full comparison of the decision with the view (verifyDiff).
func TestMain(m *testing.M) {
	verifyWrites = true
	os.Exit(m.Run())
}
