"""What the outside asks: the control socket's verbs, reload requests, the gateway's link, the metrics listener."""
