"""The node controller: job registry, control loop, policies, reconciler, backends, exporter."""
