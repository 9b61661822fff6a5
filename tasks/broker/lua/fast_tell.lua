-- KEYS: the preemptible runs. ARGV: the fast-news channels' prefix, a fast list.
-- Tell one worker of fast jobs waiting in a list (lua/fast_news.lua): fast jobs a worker
-- handed from its own queue to the shared lane.
-- include: fast_news
return tell_fast(KEYS[1], ARGV[1], ARGV[2])
