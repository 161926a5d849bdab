{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "spec-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name; the release name alone when it already contains the chart name. */}}
{{- define "spec-gateway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "spec-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "spec-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spec-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "spec-gateway.labels" -}}
helm.sh/chart: {{ include "spec-gateway.chart" . }}
{{ include "spec-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: gateway
app.kubernetes.io/part-of: spec-gateway
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "spec-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "spec-gateway.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "spec-gateway.image" -}}
{{- $tag := default (printf "%s-%s" .Chart.AppVersion .Values.image.variant) .Values.image.tag -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{/* The Secret holding the key digests (and the Redis URL when given inline). */}}
{{- define "spec-gateway.secretName" -}}
{{- default (include "spec-gateway.fullname" .) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "spec-gateway.flagsConfigMapName" -}}
{{- default (printf "%s-flags" (include "spec-gateway.fullname" .)) .Values.flags.existingConfigMap -}}
{{- end -}}

{{/* GPUs per pod: gpu.count, or one per tensor-parallel rank. */}}
{{- define "spec-gateway.gpuCount" -}}
{{- if gt (int .Values.gpu.count) 0 -}}
{{- .Values.gpu.count -}}
{{- else -}}
{{- .Values.engine.tensorParallelSize -}}
{{- end -}}
{{- end -}}

{{/* The image variant's pod sizes (variantSizing.<variant>). */}}
{{- define "spec-gateway.sizing" -}}
{{- toYaml (index .Values.variantSizing .Values.image.variant) -}}
{{- end -}}

{{/* The gateway container's resources: the operator's, key by key over the variant's, plus
     one GPU per tensor-parallel rank (gpu.count) when gpu.enabled. */}}
{{- define "spec-gateway.resources" -}}
{{- $sizing := include "spec-gateway.sizing" . | fromYaml -}}
{{- $resources := mergeOverwrite (deepCopy $sizing.resources) (deepCopy .Values.resources) -}}
{{- if .Values.gpu.enabled -}}
{{- $gpus := include "spec-gateway.gpuCount" . | int -}}
{{- $_ := set $resources "limits" (merge (dict .Values.gpu.resourceName $gpus) (default (dict) $resources.limits)) -}}
{{- $_ := set $resources "requests" (merge (dict .Values.gpu.resourceName $gpus) (default (dict) $resources.requests)) -}}
{{- end -}}
{{- range $key := list "requests" "limits" -}}
{{- if not (get $resources $key) -}}
{{- $_ := unset $resources $key -}}
{{- end -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end -}}

{{/* Model and drafter paths: explicit values win; pvc/initContainer default under mountPath. */}}
{{- define "spec-gateway.modelPath" -}}
{{- if .Values.engine.model -}}
{{- .Values.engine.model -}}
{{- else if has .Values.models.source (list "pvc" "initContainer" "hostPath") -}}
{{- printf "%s/%s" .Values.models.mountPath .Values.models.targetDir -}}
{{- end -}}
{{- end -}}

{{- define "spec-gateway.drafterPath" -}}
{{- if .Values.engine.drafter -}}
{{- .Values.engine.drafter -}}
{{- else if has .Values.models.source (list "pvc" "initContainer" "hostPath") -}}
{{- printf "%s/%s" .Values.models.mountPath .Values.models.drafterDir -}}
{{- end -}}
{{- end -}}

{{/* Whether the gateway gets a Redis URL at all, and from where. */}}
{{- define "spec-gateway.redisConfigured" -}}
{{- if or .Values.valkey.enabled .Values.externalRedis.url .Values.externalRedis.existingSecret -}}
true
{{- end -}}
{{- end -}}

{{/* The in-chart Valkey store: its name, labels (distinct from the gateway's, so that no
     gateway selector picks it) and the Secret holding its password. */}}
{{- define "spec-gateway.valkeyName" -}}
{{- printf "%s-valkey" (include "spec-gateway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "spec-gateway.valkeySelectorLabels" -}}
app.kubernetes.io/name: valkey
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "spec-gateway.valkeyLabels" -}}
helm.sh/chart: {{ include "spec-gateway.chart" . }}
{{ include "spec-gateway.valkeySelectorLabels" . }}
app.kubernetes.io/version: {{ .Values.valkey.image.tag | quote }}
app.kubernetes.io/component: state-store
app.kubernetes.io/part-of: spec-gateway
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "spec-gateway.valkeySecretName" -}}
{{- default (include "spec-gateway.valkeyName" .) .Values.valkey.auth.existingSecret -}}
{{- end -}}

{{/* SPECGW_REDIS_* for the gateway container: the in-chart Valkey (its password from its
     Secret as SPECGW_REDIS_PASSWORD, never in the URL) or an external Redis (URL, ACL user,
     password Secret, TLS files from a mounted Secret). */}}
{{- define "spec-gateway.redisEnv" -}}
{{- if .Values.valkey.enabled }}
- name: SPECGW_REDIS_URL
  value: {{ printf "redis://%s:%v/0" (include "spec-gateway.valkeyName" .) .Values.valkey.port | quote }}
- name: SPECGW_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "spec-gateway.valkeySecretName" . }}
      key: {{ .Values.valkey.auth.existingSecretKey }}
{{- else if (include "spec-gateway.redisConfigured" .) }}
- name: SPECGW_REDIS_URL
  valueFrom:
    secretKeyRef:
      {{- if .Values.externalRedis.existingSecret }}
      name: {{ .Values.externalRedis.existingSecret }}
      key: {{ .Values.externalRedis.existingSecretKey }}
      {{- else }}
      name: {{ include "spec-gateway.fullname" . }}-redis-url
      key: redis-url
      {{- end }}
{{- with .Values.externalRedis.username }}
- name: SPECGW_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- with .Values.externalRedis.passwordSecret }}
- name: SPECGW_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.externalRedis.passwordSecretKey }}
{{- end }}
{{- with .Values.externalRedis.tls.existingSecret }}
- name: SPECGW_REDIS_TLS_CA_FILE
  value: /etc/spec-gateway-redis-tls/ca.crt
{{- if $.Values.externalRedis.tls.clientCertificate }}
- name: SPECGW_REDIS_TLS_CERT_FILE
  value: /etc/spec-gateway-redis-tls/tls.crt
- name: SPECGW_REDIS_TLS_KEY_FILE
  value: /etc/spec-gateway-redis-tls/tls.key
{{- end }}
- name: SPECGW_REDIS_TLS_CHECK_HOSTNAME
  value: {{ $.Values.externalRedis.tls.checkHostname | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Settings combinations the gateway would refuse at start, refused at render time instead. */}}
{{- define "spec-gateway.validate" -}}
{{- if and .Values.valkey.enabled (or .Values.externalRedis.url .Values.externalRedis.existingSecret) -}}
{{- fail "set either valkey.enabled or externalRedis, not both" -}}
{{- end -}}
{{- if and .Values.externalRedis.tls.existingSecret (not (hasPrefix "rediss://" .Values.externalRedis.url)) (not .Values.externalRedis.existingSecret) -}}
{{- fail "externalRedis.tls needs a rediss:// URL" -}}
{{- end -}}
{{- if and .Values.httpRoute.enabled (not .Values.httpRoute.parentRefs) -}}
{{- fail "httpRoute.enabled needs httpRoute.parentRefs (the Gateway to attach to)" -}}
{{- end -}}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) -}}
{{- fail "ingress.enabled needs at least one entry in ingress.hosts" -}}
{{- end -}}
{{- if and (eq .Values.models.source "embedded") (eq .Values.image.variant "cuda") (not .Values.engine.model) -}}
{{- fail "the cuda image has no embedded model: set models.source to pvc or initContainer, or engine.model" -}}
{{- end -}}
{{- $own := dict "revision" "engine.revision" "max_num_seqs" "engine.maxNumSeqs" "max_model_len" "engine.maxModelLen" "enforce_eager" "engine.enforceEager" "tensor_parallel_size" "engine.tensorParallelSize" "gpu_memory_utilization" "engine.gpuMemoryUtilization" "served_model_name" "gateway.config.served_model_name" -}}
{{- range $argument, $value := $own -}}
{{- if hasKey $.Values.engine.extraArgs $argument -}}
{{- fail (printf "engine.extraArgs.%s: set %s instead (the gateway keeps its own copy of it)" $argument $value) -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.models.source "pvc") (not .Values.models.pvc.existingClaim) -}}
{{- fail "models.source=pvc needs models.pvc.existingClaim" -}}
{{- end -}}
{{- if and (eq .Values.models.source "initContainer") (not .Values.models.initContainer.image.repository) -}}
{{- fail "models.source=initContainer needs models.initContainer.image.repository" -}}
{{- end -}}
{{- if and (eq .Values.models.source "hostPath") (not .Values.models.hostPath.path) -}}
{{- fail "models.source=hostPath needs models.hostPath.path (the node's directory holding the model and drafter)" -}}
{{- end -}}
{{- if and (eq .Values.models.source "image") (not (and .Values.engine.model .Values.engine.drafter)) -}}
{{- fail "models.source=image needs engine.model and engine.drafter (their directories inside the image)" -}}
{{- end -}}
{{- if and .Values.scratch.cacheExistingClaim .Values.scratch.cacheEphemeral.enabled -}}
{{- fail "set either scratch.cacheExistingClaim or scratch.cacheEphemeral.enabled, not both" -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled .Values.keda.enabled -}}
{{- fail "set either autoscaling.enabled (an HPA) or keda.enabled (a KEDA ScaledObject, which makes its own HPA), not both" -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.minReplicas) 1) -}}
{{- fail "autoscaling.minReplicas 0 needs keda.enabled (an HPA does not scale to zero)" -}}
{{- end -}}
{{- if and .Values.keda.enabled (eq .Values.autoscaling.metric "cpu") -}}
{{- fail "keda.enabled scales on a gateway series: set autoscaling.metric to queueDepth or runningRequests" -}}
{{- end -}}
{{- if and .Values.keda.enabled (not .Values.keda.prometheus.serverAddress) -}}
{{- fail "keda.enabled needs keda.prometheus.serverAddress (the Prometheus KEDA queries)" -}}
{{- end -}}
{{- if and .Values.metrics.prometheusRule.enabled (not .Values.metrics.prometheusRule.runbookBaseUrl) -}}
{{- fail "metrics.prometheusRule.enabled needs metrics.prometheusRule.runbookBaseUrl: where the repository's deploy/runbooks/ is browsable, e.g. https://github.com/<org>/spec-gateway/blob/v0.1.0/deploy/runbooks" -}}
{{- end -}}
{{- if and .Values.inferencePool.enabled (not .Values.inferencePool.endpointPicker.name) -}}
{{- fail "inferencePool.enabled needs inferencePool.endpointPicker.name (the endpoint picker's Service)" -}}
{{- end -}}
{{- end -}}
