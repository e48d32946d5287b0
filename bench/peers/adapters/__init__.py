"""One module per system, each exposing ADAPTER (see peers.common.Adapter)."""
