-- Views the analysis reads (DESIGN §8, §9). Loaded by Store at every open as TEMP views, so
-- they never change the file and always match this mkb. They carry facts only (what happened
-- in each trial and how trials pair into cells); metric parameters and formulas (clip bounds,
-- thresholds, delta) live once in mkb/analysis/params.py and metrics.py.
-- Statements are separated by ";" + newline (Store splits on it): keep comments inside them.
-- States, statuses and arms are written as placeholders such as {state.FINISHED}, {status.PASSED} and
-- {arm.SOLO_TIRX}: the Store fills in the members of mkb.records.State, Status and Arm, so a renamed
-- member fails at open instead of leaving a stale literal here.

-- One row per model: whether it is an oracle (the built-in `reference` agent or a run
-- flagged is_oracle), and the label every table and figure shows for it.
CREATE OR REPLACE VIEW model_labels AS
WITH seen AS (
    SELECT model, coalesce(is_oracle, false) AS is_oracle FROM runs
    UNION ALL
    SELECT DISTINCT model, false FROM trials
)
SELECT model,
       bool_or(is_oracle) OR model = 'reference' AS is_oracle,
       CASE WHEN bool_or(is_oracle) OR model = 'reference' THEN model || ' (oracle)' ELSE model END AS label
FROM seen
GROUP BY model;

-- One row per trial with what the metrics need. `counted`: the trial enters the metrics —
-- a finished attempt whose final grading was not an infrastructure failure, or a skill trial
-- skipped because its source wrote no SKILL.md (scored as no change). Trials that ended in
-- infra_error, were interrupted or are still running are never charged to the model.
-- `attempted`: an attempt was made and graded (counted and not skipped). `speedup` is 0
-- unless passed (DESIGN §9).
CREATE OR REPLACE VIEW trial_outcomes AS
SELECT t.model, m.is_oracle, m.label AS model_label, t.trial_id, t.run_id, t.problem_id,
       coalesce(p.family, 'unknown') AS family, t.replicate, t.arm, t.dsl, t.state, t.status,
       (t.state = '{state.FINISHED}' AND coalesce(t.status, '') <> '{status.INFRA_ERROR}')
           OR (t.state = '{state.SKIPPED}' AND ends_with(t.arm, '_skill')) AS counted,
       t.state = '{state.FINISHED}' AND coalesce(t.status, '') <> '{status.INFRA_ERROR}' AS attempted,
       t.state = '{state.SKIPPED}' AND ends_with(t.arm, '_skill') AS skipped,
       t.state = '{state.FINISHED}' AND t.status = '{status.PASSED}' AS passed,
       CASE WHEN t.state = '{state.FINISHED}' AND t.status = '{status.PASSED}' THEN coalesce(t.speedup, 0) ELSE 0 END AS speedup,
       t.source_trial_id, t.skill_sha256, t.kernel_ms, t.eager_ms, t.wall_s, t.queue_s,
       t.n_submissions, t.n_turns, t.prompt_tokens, t.completion_tokens, t.cost_usd,
       t.attempt_id, t.ending, t.timed_out, t.charged_s, t.total_s, t.time_left_s, t.n_handoffs,
       t.n_correct_draws, t.cached_tokens, t.cost_source, t.dsl_share
FROM trials t
JOIN model_labels m USING (model)
LEFT JOIN problems p USING (problem_id);

-- One row per cell (model, problem, direction, replicate) that has at least one of its three
-- trials: source = solo in DSL a, base = solo in DSL b, skill = a2b_skill (DESIGN §1).
-- `complete`: base and skill are both counted, so the cell has a paired ratio.
CREATE OR REPLACE VIEW cells AS
WITH directions(direction, source_arm, base_arm, skill_arm) AS (
    VALUES ('cutedsl2tirx', '{arm.SOLO_CUTEDSL}', '{arm.SOLO_TIRX}', '{arm.CUTEDSL2TIRX_SKILL}'),
           ('tirx2cutedsl', '{arm.SOLO_TIRX}', '{arm.SOLO_CUTEDSL}', '{arm.TIRX2CUTEDSL_SKILL}')
),
keys AS (
    SELECT DISTINCT o.model, o.is_oracle, o.model_label, o.problem_id, o.family, o.replicate, d.*
    FROM trial_outcomes o
    JOIN directions d ON o.arm IN (d.source_arm, d.base_arm, d.skill_arm)
)
SELECT k.model, k.is_oracle, k.model_label, k.problem_id, k.family, k.direction, k.replicate,
       k.source_arm, k.base_arm, k.skill_arm,
       src.trial_id AS source_trial_id, src.state AS source_state, src.status AS source_status,
       coalesce(src.counted, false) AS source_counted, src.passed AS source_passed,
       src.speedup AS source_speedup,
       base.trial_id AS base_trial_id, base.state AS base_state, base.status AS base_status,
       coalesce(base.counted, false) AS base_counted, base.passed AS base_passed,
       base.speedup AS base_speedup,
       skill.trial_id AS skill_trial_id, skill.state AS skill_state, skill.status AS skill_status,
       coalesce(skill.counted, false) AS skill_counted, skill.passed AS skill_passed,
       skill.speedup AS skill_speedup, coalesce(skill.skipped, false) AS skill_skipped,
       coalesce(skill.skill_sha256, sk.sha256) AS skill_sha256,
       coalesce(base.counted, false) AND coalesce(skill.counted, false) AS complete
FROM keys k
LEFT JOIN trial_outcomes src
    ON src.model = k.model AND src.problem_id = k.problem_id AND src.replicate = k.replicate
   AND src.arm = k.source_arm
LEFT JOIN trial_outcomes base
    ON base.model = k.model AND base.problem_id = k.problem_id AND base.replicate = k.replicate
   AND base.arm = k.base_arm
LEFT JOIN trial_outcomes skill
    ON skill.model = k.model AND skill.problem_id = k.problem_id AND skill.replicate = k.replicate
   AND skill.arm = k.skill_arm
LEFT JOIN skills sk ON sk.attempt_id = src.attempt_id;

-- Usage per model and arm over the attempts made (counted, not skipped): tokens, cost, time.
CREATE OR REPLACE VIEW arm_usage AS
SELECT model, model_label, is_oracle, arm,
       count(*) AS attempts,
       sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens,
       avg(prompt_tokens) AS prompt_tokens_mean, avg(completion_tokens) AS completion_tokens_mean,
       sum(cost_usd) AS cost_usd, avg(cost_usd) AS cost_usd_mean,
       sum(wall_s) AS wall_s, avg(wall_s) AS wall_s_mean, median(wall_s) AS wall_s_median,
       avg(queue_s) AS queue_s_mean, avg(n_submissions) AS n_submissions_mean
FROM trial_outcomes
WHERE attempted
GROUP BY model, model_label, is_oracle, arm
;

-- One row per calibrated problem and timing mode (mkb calibrate, table noise_floors): its noise floor,
-- the largest spread (max/min - 1 of the speedups of repeated final gradings of one kernel) among its
-- variants and GPUs. The report compares paired ratios with max(delta, floor) beside the paper's delta.
CREATE OR REPLACE VIEW problem_floors AS
SELECT problem_id, timing, max(spread) AS floor, count(*) AS variants, min(repeats) AS repeats,
       max(created_at) AS calibrated_at
FROM noise_floors
GROUP BY problem_id, timing;

-- One row per trial with its current attempt's last final grading (a regrade adds a later one): the
-- profiler's device time of the kernel and of the eager reference per call, and how the grading ran
-- (details.grading.mode: single, or final over several fresh processes). The report's device-time
-- appendix recomputes Table 1 from device_speedup = eager_device_ms / device_ms.
CREATE OR REPLACE VIEW final_gradings AS
SELECT t.model, t.trial_id, s.attempt_id, s.n, s.status, s.speedup, s.kernel_ms, s.eager_ms,
       TRY_CAST(json_extract(s.record, '$.details.device_ms') AS DOUBLE) AS device_ms,
       TRY_CAST(json_extract(s.record, '$.details.eager_device_ms') AS DOUBLE) AS eager_device_ms,
       coalesce(json_extract_string(s.record, '$.details.grading.mode'), 'single') AS grading_mode,
       TRY_CAST(json_extract(s.record, '$.details.grading.processes') AS INTEGER) AS processes,
       CASE WHEN s.status = '{status.PASSED}'
            THEN TRY_CAST(json_extract(s.record, '$.details.eager_device_ms') AS DOUBLE)
                 / nullif(TRY_CAST(json_extract(s.record, '$.details.device_ms') AS DOUBLE), 0) END AS device_speedup
FROM trials t
JOIN submissions s ON s.attempt_id = t.attempt_id AND s.kind = 'final'
QUALIFY row_number() OVER (PARTITION BY t.model, t.trial_id ORDER BY s.n DESC) = 1
