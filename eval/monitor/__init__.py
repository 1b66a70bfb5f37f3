"""Production monitoring: acceptance windows per domain, drift alerts, retraining, the promotion gate."""
