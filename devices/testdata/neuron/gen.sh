#!/bin/sh
# Regenerates the Neuron sysfs fixtures: one tree per node type, laid out as
# the aws-neuron-driver publishes it (neuron_cdev.c, neuron_sysfs_metrics.c,
# neuron_dhal_v*.c). Topologies are the driver's own tables
# (trn1_32xl_neigbor_ids, inf2_48xl_neighbor_ids); trn2 reuses the trn1 4x4
# torus. Formats: core_count "%d" without newline, connected_devices
# "a, b, c, d\n", ECC counters "%u\n".
#
#   trn1  trn1.32xlarge: 16 x Trainium1, 2 NeuronCores each, ECC counters
#   trn2  trn2.48xlarge: 16 x Trainium2, 8 NeuronCores each (4 logical at LNC=2)
#   inf2  inf2.48xlarge: 12 x Inferentia2, 2 NeuronCores each, an older
#         driver (2.13) without stats/hardware ECC counters
set -eu
cd "$(dirname "$0")"
rm -rf trn1 trn2 inf2

torus() { # trn1_32xl_neigbor_ids
	case $1 in
	0) echo "12, 3, 4, 1" ;; 1) echo "13, 0, 5, 2" ;; 2) echo "14, 1, 6, 3" ;; 3) echo "15, 2, 7, 0" ;;
	4) echo "0, 7, 8, 5" ;; 5) echo "1, 4, 9, 6" ;; 6) echo "2, 5, 10, 7" ;; 7) echo "3, 6, 11, 4" ;;
	8) echo "4, 11, 12, 9" ;; 9) echo "5, 8, 13, 10" ;; 10) echo "6, 9, 14, 11" ;; 11) echo "7, 10, 15, 8" ;;
	12) echo "8, 15, 0, 13" ;; 13) echo "9, 12, 1, 14" ;; 14) echo "10, 13, 2, 15" ;; 15) echo "11, 14, 3, 12" ;;
	esac
}
ring12() { # inf2_48xl_neighbor_ids
	echo "$((($1 + 11) % 12)), $((($1 + 1) % 12))"
}

# node count cores name arch instance topology ecc
mk() {
	node=$1 count=$2 cores=$3 name=$4 arch=$5 inst=$6 topo=$7 ecc=$8
	i=0
	while [ "$i" -lt "$count" ]; do
		d=$node/sys/devices/virtual/neuron_device/neuron$i
		mkdir -p "$d/info/architecture" "$node/dev"
		printf '%s' "$cores" >"$d/core_count"
		printf '%s\n' "$($topo "$i")" >"$d/connected_devices"
		printf '%s\n' "$name" >"$d/info/architecture/device_name"
		printf '%s\n' "$arch" >"$d/info/architecture/arch_type"
		printf '%s\n' "$inst" >"$d/info/architecture/instance_type"
		printf '%s\n' "-1" >"$d/info/notify_delay"
		printf '%016x\n' "$((0x5e0000 + i))" >"$d/info/serial_number"
		if [ "$ecc" = yes ]; then
			mkdir -p "$d/stats/hardware"
			printf '0\n' >"$d/stats/hardware/mem_ecc_uncorrected"
			printf '0\n' >"$d/stats/hardware/sram_ecc_uncorrected"
			printf '0\n' >"$d/stats/hardware/mem_ecc_repairable_uncorrected"
		fi
		: >"$node/dev/neuron$i"
		i=$((i + 1))
	done
}

mk trn1 16 2 Trainium1 NDv2 Trn1 torus yes
mk trn2 16 8 Trainium2 NDv3 Trn2 torus yes
mk inf2 12 2 Inferentia2 NDv2 Inf2 ring12 no
