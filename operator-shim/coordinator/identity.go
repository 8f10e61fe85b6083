package coordinator

import (
	"fmt"
	"os"
)

func defaultIdentity() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", h, os.Getpid())
}
