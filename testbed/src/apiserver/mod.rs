//! Fake Kubernetes API server (HTTPS, client certificates and bearer tokens).
