"""The data path: forward one request to one endpoint over pooled HTTP/1.1, retry within a budget, relay
the answer."""
