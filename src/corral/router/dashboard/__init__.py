"""The router's live fleet dashboard: one HTML page (`GET /dashboard`) and its Server-Sent Events feed
(`GET /dashboard/events`), both admin routes guarded like `/v1/fleet`."""
