-- The rows every sync rewrites stay small on disk (issue 19). A node's row
-- is rewritten on each heartbeat (every few seconds: its health and when
-- it was heard) and an agent's on each liveness flush (every 250 ms). With
-- full pages, a quarter of those updates could not stay on their page: at
-- 40,000 GPUs the 5,440-row `nodes` table grew to 80 MB (16 times its live
-- rows) within minutes of a burst, and every read of the fleet (each
-- scheduling pass, the region's status) scanned all of it. Half-full
-- pages keep each new version beside the old one (a HOT update, no index
-- touched; the page prunes itself), and autovacuum visits these tables at
-- a small share of dead rows instead of a fifth of the table.
ALTER TABLE nodes SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02,
                       autovacuum_vacuum_cost_delay = 0);
ALTER TABLE agents SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02,
                        autovacuum_vacuum_cost_delay = 0);
