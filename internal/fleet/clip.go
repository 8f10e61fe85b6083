package fleet

import "fmt"

// maxShown is how much of a key or name read from etcd a message shows:
// etcd keys may be up to 1.5 MB long, and whoever wrote one (a team's
// user, a malformed record) must not fill every log line and every user's
// terminal with it.
const maxShown = 160

// ClipKey returns key as a message shows it: whole when short, else its
// first bytes and how long it was.
func ClipKey[T ~string | ~[]byte](key T) string {
	if len(key) <= maxShown {
		return string(key)
	}
	return fmt.Sprintf("%s...(%d bytes)", string(key[:maxShown]), len(key))
}
