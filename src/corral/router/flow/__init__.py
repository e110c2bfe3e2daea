"""Flow control (`corral router --flow-control`): while every eligible engine of a model is saturated,
requests wait in the router, in priority bands, shared fairly among tenants, and go on as room comes
back (issue 33)."""
