package tracestore

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fixture is an /api/traces answer as Jaeger's query service writes it: a
// decision span of the coordinator with an agent's child, listed child
// first.
const fixture = `{"data":[{"traceID":"t1","spans":[
 {"traceID":"t1","spanID":"b","operationName":"agent.stop","references":[{"refType":"CHILD_OF","traceID":"t1","spanID":"a"}],
  "startTime":1700000000200000,"duration":300000,"tags":[{"key":"node","type":"string","value":"n1"}],"processID":"p2"},
 {"traceID":"t1","spanID":"a","operationName":"coordinator.decision","references":[],
  "startTime":1700000000000000,"duration":1000,"tags":[{"key":"job","type":"string","value":"tj"},{"key":"to_size","type":"int64","value":1},{"key":"ok","type":"bool","value":true}],"processID":"p1"}],
 "processes":{"p1":{"serviceName":"hyperpod-coordinator","tags":[]},"p2":{"serviceName":"hyperpod-agent","tags":[{"key":"hyperpodrun.node","type":"string","value":"n9"}]}},"warnings":null}],
 "total":0,"limit":0,"offset":0,"errors":null}`

func TestParseTraces(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		wantErr    string
		check      func(t *testing.T, ts []Trace)
	}{
		{name: "spans ordered by start, parents from CHILD_OF, services from processes", body: fixture, check: func(t *testing.T, ts []Trace) {
			if len(ts) != 1 || len(ts[0].Spans) != 2 {
				t.Fatalf("%+v", ts)
			}
			a, b := ts[0].Spans[0], ts[0].Spans[1]
			if a.SpanID != "a" || b.SpanID != "b" || b.ParentSpanID != "a" || a.ParentSpanID != "" {
				t.Errorf("spans %+v %+v", a, b)
			}
			if a.Service != "hyperpod-coordinator" || b.Service != "hyperpod-agent" {
				t.Errorf("services %q %q", a.Service, b.Service)
			}
			if b.Resource["hyperpodrun.node"] != "n9" || a.Resource != nil {
				t.Errorf("resources %v %v", a.Resource, b.Resource)
			}
			if a.Attributes["job"] != "tj" || a.Attributes["to_size"] != "1" || a.Attributes["ok"] != "true" {
				t.Errorf("attributes %v", a.Attributes)
			}
			if !a.Start.Equal(time.UnixMicro(1700000000000000)) || b.Duration != 300*time.Millisecond {
				t.Errorf("times %v %v", a.Start, b.Duration)
			}
			if r, ok := ts[0].Root(); !ok || r.SpanID != "a" {
				t.Errorf("root %+v", r)
			}
		}},
		{name: "no data is no traces", body: `{"data":null}`, check: func(t *testing.T, ts []Trace) {
			if len(ts) != 0 {
				t.Errorf("%+v", ts)
			}
		}},
		{name: "a follows-from reference is a parent when no CHILD_OF", body: `{"data":[{"traceID":"t","spans":[
			{"spanID":"x","startTime":1,"duration":1,"processID":"nope"},
			{"spanID":"y","startTime":2,"duration":1,"references":[{"refType":"FOLLOWS_FROM","spanID":"x"}]}]}]}`,
			check: func(t *testing.T, ts []Trace) {
				if ts[0].Spans[1].ParentSpanID != "x" || ts[0].Spans[0].Service != "" || ts[0].Spans[1].TraceID != "t" {
					t.Errorf("%+v", ts[0].Spans)
				}
			}},
		{name: "the query's errors are an error", body: `{"data":null,"errors":[{"code":400,"msg":"bad service"}]}`, wantErr: "400 bad service"},
		{name: "bad JSON is an error", body: `{"data":[{"traceID":`, wantErr: "decode answer"},
		{name: "data of the wrong shape is an error", body: `{"data":{"x":1}}`, wantErr: "decode traces"},
		{name: "a span without ID is an error", body: `{"data":[{"traceID":"t","spans":[{"startTime":1}]}]}`, wantErr: "without spanID"},
		{name: "a negative duration is an error", body: `{"data":[{"traceID":"t","spans":[{"spanID":"s","duration":-5}]}]}`, wantErr: "negative duration"},
		{name: "not JSON at all is an error", body: `<html>`, wantErr: "decode answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, err := ParseTraces([]byte(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, ts)
		})
	}
}

func TestParseServices(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
		wantErr          bool
	}{
		{name: "sorted", body: `{"data":["b","a"],"total":2}`, want: "a,b"},
		{name: "none", body: `{"data":null}`, want: ""},
		{name: "bad JSON", body: `{"data":[1,`, wantErr: true},
		{name: "not strings", body: `{"data":[1]}`, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseServices([]byte(tc.body))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v", err)
			}
			if got := strings.Join(s, ","); err == nil && got != tc.want {
				t.Errorf("%q, want %q", got, tc.want)
			}
		})
	}
}

// The client sends the service, the tags as a JSON map and the limit, and
// reports a failing answer with its status.
func TestClientQuery(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/traces" && r.URL.Query().Get("service") == "down" {
			http.Error(w, "storage down", http.StatusInternalServerError)
			return
		}
		got = r.URL.Path + " service=" + r.URL.Query().Get("service") + " tags=" + r.URL.Query().Get("tags") + " limit=" + r.URL.Query().Get("limit")
		w.Write([]byte(fixture))
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := NewClient(srv.URL + "/")
	ts, err := c.Traces(ctx, "hyperpod-coordinator", map[string]string{"job": "tj"}, 5)
	if err != nil || len(ts) != 1 {
		t.Fatalf("%v %+v", err, ts)
	}
	if want := `/api/traces service=hyperpod-coordinator tags={"job":"tj"} limit=5`; got != want {
		t.Errorf("query %q, want %q", got, want)
	}
	if _, err := c.Traces(ctx, "down", nil, 0); err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "storage down") {
		t.Errorf("err %v, want the status and message", err)
	}
	srv.Close()
	if _, err := c.Traces(ctx, "x", nil, 0); err == nil {
		t.Error("no error from a closed server")
	}
}
