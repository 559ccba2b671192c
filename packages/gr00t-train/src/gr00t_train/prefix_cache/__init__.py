"""`data.prefix_cache`: the setting (`config`), the cache a run opens (`cache`), how it is built (`build`), where its
features live (`store`) and the batches read from it (`source`)."""
