package nodeagent

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hyperpodrun/hyperpodrun/devices"
)

// metrics are one agent's Prometheus series, in its own registry so that
// several agents can share a process.
type metrics struct {
	reg             *prometheus.Registry
	gpus            prometheus.Gauge
	gpusHealthy     prometheus.Gauge
	neuron          prometheus.Gauge
	neuronHealthy   prometheus.Gauge
	neuronCores     prometheus.Gauge
	registered      prometheus.Gauge
	draining        prometheus.Gauge
	discoveryErrors prometheus.Counter
	writes          prometheus.Counter
	leaseLost       prometheus.Counter
	etcdDataLoss    prometheus.Counter
}

func newMetrics(node string) *metrics {
	labels := prometheus.Labels{"node": node}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "hyperpod_agent", Name: name, Help: help, ConstLabels: labels})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "hyperpod_agent", Name: name, Help: help, ConstLabels: labels})
	}
	m := &metrics{
		reg:             prometheus.NewRegistry(),
		gpus:            gauge("gpus", "NVIDIA GPUs found on the node."),
		gpusHealthy:     gauge("gpus_healthy", "NVIDIA GPUs found healthy."),
		neuron:          gauge("neuron_devices", "AWS Neuron devices found on the node."),
		neuronHealthy:   gauge("neuron_devices_healthy", "AWS Neuron devices found healthy."),
		neuronCores:     gauge("neuron_cores", "Logical NeuronCores on the node."),
		registered:      gauge("registered", "1 while the node's inventory is registered in etcd under a live lease."),
		draining:        gauge("draining", "1 once the node is draining."),
		discoveryErrors: counter("discovery_errors_total", "Inventory passes that failed or were partial."),
		writes:          counter("inventory_writes_total", "Writes of the node's inventory to etcd."),
		leaseLost:       counter("lease_lost_total", "Times the node's lease was lost and the node re-registered."),
		etcdDataLoss:    counter("etcd_data_loss_total", "Times the agent found that etcd lost its data (wiped, a new cluster, an older snapshot restored) and stopped the node's jobs."),
	}
	m.reg.MustRegister(m.gpus, m.gpusHealthy, m.neuron, m.neuronHealthy, m.neuronCores,
		m.registered, m.draining, m.discoveryErrors, m.writes, m.leaseLost, m.etcdDataLoss,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(inv *devices.Inventory) {
	m.gpus.Set(float64(len(inv.GPUs())))
	m.gpusHealthy.Set(float64(inv.Healthy(devices.KindNVIDIA)))
	m.neuron.Set(float64(len(inv.NeuronDevices())))
	m.neuronHealthy.Set(float64(inv.Healthy(devices.KindNeuron)))
	m.neuronCores.Set(float64(inv.NeuronCores()))
}

// handler serves /healthz (200 while registered, 503 otherwise), /metrics
// and /inventory (the registered inventory as JSON).
func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ok, msg := a.health()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, msg)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /inventory", func(w http.ResponseWriter, r *http.Request) {
		inv := a.Inventory()
		if inv == nil {
			http.Error(w, "not registered yet", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(inv)
	})
	return mux
}
