"""The router's edge toward clients: connection and request limits, tenants and their keys, admin access."""
