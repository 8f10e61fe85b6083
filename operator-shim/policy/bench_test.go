package policy

import (
	"testing"
	"time"
)

// BenchmarkScheduleSteady measures a steady-state cycle on a mixed state
// (2,000 nodes, 5,000 jobs, 40 teams); bench/engine runs the full-size one.
func BenchmarkScheduleSteady(b *testing.B) {
	st := bigState(2000, 5000, 40, 5)
	d := Schedule(st)
	st.Allocations = d.Allocations
	st.Now = st.Now.Add(2 * time.Minute)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Schedule(st)
	}
}
