"""Multi-host groups: the daemons' HTTP API, the Ray nodes, and the leader's group runtime."""
