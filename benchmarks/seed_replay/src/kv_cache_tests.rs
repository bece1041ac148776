// The seed's kv_cache.rs ends with `#[path = "kv_cache_tests.rs"] mod kv_cache_tests;`; its tests
// were not given with it, so the module is empty. The replay's check is its checksum.
