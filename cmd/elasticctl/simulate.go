package main

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// simulateCommand runs the policy engine in virtual time over a job trace.
func simulateCommand() *cli.Command {
	return &cli.Command{
		Name:  "simulate",
		Usage: "run the fair-share policy in virtual time over a job trace",
		Action: func(c *cli.Context) error {
			return errors.New("simulate is not built yet")
		},
	}
}
