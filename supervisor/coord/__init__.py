"""Multi-node: torch's elastic rendezvous, and job-wide agreement through its store."""
