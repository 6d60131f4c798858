"""
Settings for every host, over sparkrig's defaults.

Every setting, its default, what it allows and what it does: docs/settings.md
(generated from the SETTINGS each concern under operations/ declares). Set a key
here for every host, in group_data/<group>.py for one group, or in the inventory's
host data for one host. Settings are validated before any host is contacted: a bad
value stops the run with one message naming the host, the key and what is allowed.

For example:

    swap_remove_files = True                  # also delete /swap.img once swap is off
    containers_docker_users = ["alice"]       # the docker group is root-equivalent
    python_stack_profiles = ["unsloth"]
    gpu_clock_max_mhz = {"gb10": 2100}       # cap the SM clock of the GB10 boxes at every boot
    metrics_listen = "192.168.1.21:9100"      # node exporter beyond the loopback ...
    metrics_allow = ["192.168.1.10"]          # ... answering the fleet's Prometheus alone
    prometheus_server = "spark-01"            # the fleet's Prometheus and its alerts (docs/monitoring.md)
"""
