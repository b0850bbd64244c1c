"""The cache's admin side: `/admin/cache` (stats and clear), the cache probe, and named
snapshots, each asking workers through `router.requests.ask`."""
