package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
	"sigs.k8s.io/yaml"

	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// followTail is how many past events --follow prints when neither --since
// nor --tail says.
const followTail = 10

// parseSince reads --since: a duration before now ("10m", "2h", "1d") or
// an RFC 3339 time. "" is no bound.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if d, err := time.ParseDuration(days + "h"); err == nil && d >= 0 {
			return now.Add(-24 * d), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, errors.New("want a positive duration")
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, errors.New("want a duration (30s, 10m, 2h, 1d) or a time (2006-01-02T15:04:05Z)")
}

func cmdEvents(c *cli.Context, st *query.Store) error {
	job := eventsJob(c)
	since, _ := parseSince(c.String("since"), timeNow())
	q := query.EventQuery{Job: job, Since: since}
	if c.IsSet("tail") {
		q.Tail = c.Int("tail")
	} else if c.Bool("follow") && since.IsZero() {
		q.Tail = followTail
	}
	ctx, cancel := ctxOf(c)
	evs, bad, rev, err := st.QueryEvents(ctx, q)
	cancel()
	if err != nil {
		return err
	}
	if c.IsSet("tail") && q.Tail == 0 {
		evs = nil
	}
	warnAll(c.App.ErrWriter, bad)
	if !c.Bool("follow") {
		switch c.String("output") {
		case "json":
			return writeJSON(c.App.Writer, nonNil(evs))
		case "yaml":
			return writeYAML(c.App.Writer, nonNil(evs))
		}
		tw := newTab(c.App.Writer)
		for _, e := range evs {
			fmt.Fprintf(tw, "%s\t%s\n", e.Time.Format(time.RFC3339), eventLine(e, ""))
		}
		if len(evs) == 0 {
			fmt.Fprintln(c.App.ErrWriter, "No events found.")
		}
		return tw.Flush()
	}
	for _, e := range evs {
		printEvent(c, e)
	}
	fctx, stop := watchContext(c)
	defer stop()
	// From the revision after the history: nothing written in between is lost.
	for w := range st.Cli.Watch(fctx, st.Keys.EventsPrefix(), clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithRev(rev+1)) {
		if err := w.Err(); err != nil {
			return fmt.Errorf("follow events: %w", err)
		}
		for _, ev := range w.Events {
			e, err := fleet.DecodeEvent(string(ev.Kv.Key), ev.Kv.Value)
			if err != nil {
				warnAll(c.App.ErrWriter, []error{err})
				continue
			}
			if e.Concerns(job) {
				printEvent(c, *e)
			}
		}
	}
	return nil
}

func printEvent(c *cli.Context, e fleet.Event) {
	switch c.String("output") {
	case "json":
		b, _ := json.Marshal(e)
		fmt.Fprintln(c.App.Writer, string(b))
		return
	case "yaml":
		b, _ := yaml.Marshal(e)
		fmt.Fprintf(c.App.Writer, "---\n%s", b)
		return
	}
	fmt.Fprintf(c.App.Writer, "%s  %s\n", e.Time.Format(time.RFC3339), eventLine(e, ""))
}
