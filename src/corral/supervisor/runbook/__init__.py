"""The runbook's operations on one supervised engine (sleep, wake, weight reload), each a
`corral.supervisor.runbook.template.RunbookPlan`; `start_operation` is how the management API starts one."""
