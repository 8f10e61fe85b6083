package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// RunElastic runs the elastic agent on the etcd rendezvous.
func RunElastic(ctx context.Context, o Options) error {
	return &ExitError{2, errors.New("the etcd rendezvous is not built yet")}
}

func splitHostPort(ep string, defPort int) (string, int, error) {
	host, p, err := net.SplitHostPort(ep)
	if err != nil {
		return ep, defPort, nil
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: the port must be a number 0-65535", ep)
	}
	return host, port, nil
}
