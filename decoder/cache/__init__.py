"""Key/value caches fed a tree under its mask, then cut to the accepted path: a request's arena, a batch's."""
