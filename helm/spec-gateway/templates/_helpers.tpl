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

{{/* Model and drafter paths: explicit values win; pvc/initContainer default under mountPath. */}}
{{- define "spec-gateway.modelPath" -}}
{{- if .Values.engine.model -}}
{{- .Values.engine.model -}}
{{- else if ne .Values.models.source "embedded" -}}
{{- printf "%s/%s" .Values.models.mountPath .Values.models.targetDir -}}
{{- end -}}
{{- end -}}

{{- define "spec-gateway.drafterPath" -}}
{{- if .Values.engine.drafter -}}
{{- .Values.engine.drafter -}}
{{- else if ne .Values.models.source "embedded" -}}
{{- printf "%s/%s" .Values.models.mountPath .Values.models.drafterDir -}}
{{- end -}}
{{- end -}}

{{/* Whether the gateway gets a Redis URL at all, and from where. */}}
{{- define "spec-gateway.redisConfigured" -}}
{{- if or .Values.redis.enabled .Values.externalRedis.url .Values.externalRedis.existingSecret -}}
true
{{- end -}}
{{- end -}}

{{/* Settings combinations the gateway would refuse at start, refused at render time instead. */}}
{{- define "spec-gateway.validate" -}}
{{- if and .Values.redis.enabled (or .Values.externalRedis.url .Values.externalRedis.existingSecret) -}}
{{- fail "set either redis.enabled or externalRedis, not both" -}}
{{- end -}}
{{- if and (eq .Values.models.source "embedded") (eq .Values.image.variant "cuda") (not .Values.engine.model) -}}
{{- fail "the cuda image has no embedded model: set models.source to pvc or initContainer, or engine.model" -}}
{{- end -}}
{{- if and (eq .Values.models.source "pvc") (not .Values.models.pvc.existingClaim) -}}
{{- fail "models.source=pvc needs models.pvc.existingClaim" -}}
{{- end -}}
{{- if and (eq .Values.models.source "initContainer") (not .Values.models.initContainer.image.repository) -}}
{{- fail "models.source=initContainer needs models.initContainer.image.repository" -}}
{{- end -}}
{{- end -}}
