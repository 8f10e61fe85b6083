package api

import (
	"math/rand"
	"regexp"
	"strings"
	"testing"
)

// The DNS-1123 label rule as Kubernetes writes it; ValidateName must accept
// exactly the names it matches (up to 63 bytes).
var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestValidateNameTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"llama-70b-sweep", true},
		{"a", true},
		{"0", true},
		{"a-b", true},
		{"a--b", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"", false},
		{"-", false},
		{"-a", false},
		{"a-", false},
		{"A", false},
		{"a_b", false},
		{"a.b", false},
		{"a/b", false},
		{"../etc", false},
		{"a\n", false},
		{"é", false},
	} {
		err := ValidateName("job", tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "DNS-1123") {
			t.Errorf("ValidateName(%q): error %q does not say the rule", tc.name, err)
		}
	}
}

// TestValidateNameMatchesRegexp checks random strings over the label
// alphabet and a few bytes outside it against the regular expression.
func TestValidateNameMatchesRegexp(t *testing.T) {
	const alphabet = "ab09-Z_./\x00é"
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 200000; i++ {
		n := r.Intn(70)
		var b strings.Builder
		for j := 0; j < n; j++ {
			b.WriteByte(alphabet[r.Intn(len(alphabet))])
		}
		s := b.String()
		want := len(s) <= 63 && dns1123Label.MatchString(s)
		if got := ValidateName("job", s) == nil; got != want {
			t.Fatalf("ValidateName(%q) ok=%v, the regexp says %v", s, got, want)
		}
	}
}
