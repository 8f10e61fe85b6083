package fleet

import (
	"fmt"
	"strings"
	"unicode"
)

// ValidatePrefix checks a key prefix a user gave (a command's
// --etcd-prefix): absolute, without a trailing slash or an empty segment,
// without spaces or control characters. Its errors say what to give
// instead; the caller adds the flag's name.
func ValidatePrefix(prefix string) error {
	switch {
	case prefix == "" || prefix == "/" || !strings.HasPrefix(prefix, "/"):
		return fmt.Errorf("want an absolute key prefix like %s", DefaultPrefix)
	case strings.HasSuffix(prefix, "/"):
		return fmt.Errorf("drop the trailing slash: %s", strings.TrimRight(prefix, "/"))
	case strings.Contains(prefix, "//"):
		return fmt.Errorf("empty segment (//): want an absolute key prefix like %s", DefaultPrefix)
	case strings.IndexFunc(prefix, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return fmt.Errorf("spaces or control characters: want an absolute key prefix like %s", DefaultPrefix)
	}
	return nil
}
