"""The node's hardware map: GPUs (NVML), NICs and InfiniBand ports (sysfs), and which NIC is
nearest each GPU; collected by the Prolog, joined with each rank's place afterwards."""
