"""What dankserve knows about the machine: GPUs, CPUs, memory, NUMA, disks."""
