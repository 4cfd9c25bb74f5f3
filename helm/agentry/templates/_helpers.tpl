{{/*
Chart name, cut to 63 characters.
*/}}
{{- define "agentry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's resources. Cut to 52 characters: the StatefulSet
adds "-<ordinal>" to pod names and the headless Service adds "-headless",
and both must remain valid DNS labels (63 characters).
*/}}
{{- define "agentry.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart label value.
*/}}
{{- define "agentry.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels that select the release's pods. Never change these: a StatefulSet's
selector is immutable.
*/}}
{{- define "agentry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "agentry.labels" -}}
helm.sh/chart: {{ include "agentry.chart" . }}
{{ include "agentry.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentry
{{- end }}

{{/*
Labels of auxiliary pods (backup job, helm test): the common labels WITHOUT
app.kubernetes.io/name, so that they never match the selector of the
Services, the PodDisruptionBudget or the server NetworkPolicy (a PDB with
maxUnavailable stops allowing evictions when it selects pods that have no
scalable controller, such as a Job's or a bare test pod).
*/}}
{{- define "agentry.auxLabels" -}}
helm.sh/chart: {{ include "agentry.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentry
{{- end }}

{{/*
Selector of the backup job's pods (NetworkPolicy).
*/}}
{{- define "agentry.backupSelectorLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: agentry
app.kubernetes.io/component: backup
{{- end }}

{{/*
Name of the headless Service that gives each pod its stable DNS name.
*/}}
{{- define "agentry.headlessServiceName" -}}
{{- printf "%s-headless" (include "agentry.fullname" .) }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "agentry.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentry.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Name of the Secret holding the admin key (the chart's own or an existing one).
*/}}
{{- define "agentry.clusterSecretName" -}}
{{- if .Values.clusterAuth.existingSecret }}
{{- .Values.clusterAuth.existingSecret }}
{{- else }}
{{- printf "%s-cluster-secret" (include "agentry.fullname" .) }}
{{- end }}
{{- end }}

{{- define "agentry.secretName" -}}
{{- if .Values.auth.existingSecret }}
{{- .Values.auth.existingSecret }}
{{- else }}
{{- printf "%s-admin-key" (include "agentry.fullname" .) }}
{{- end }}
{{- end }}

{{/*
Container image reference.
*/}}
{{- define "agentry.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
{{- end }}

{{/*
DNS suffix shared by every pod's stable name:
<headless-svc>.<namespace>.svc.<clusterDomain>
*/}}
{{- define "agentry.peerDomain" -}}
{{- printf "%s.%s.svc.%s" (include "agentry.headlessServiceName" .) .Release.Namespace .Values.cluster.clusterDomain }}
{{- end }}

{{/*
Static member list of a new cluster: node id N is pod ordinal N-1.
  1=<fullname>-0.<peerDomain>:<raft>,2=<fullname>-1.<peerDomain>:<raft>,...
*/}}
{{- define "agentry.initialMembers" -}}
{{- $fullname := include "agentry.fullname" . }}
{{- $domain := include "agentry.peerDomain" . }}
{{- $port := int .Values.ports.raft }}
{{- $members := list }}
{{- range $ordinal := until (int .Values.replicas) }}
{{- $members = append $members (printf "%d=%s-%d.%s:%d" (add1 $ordinal) $fullname $ordinal $domain $port) }}
{{- end }}
{{- join "," $members }}
{{- end }}

{{/*
gRPC URL of the client Service, for in-cluster clients (helm test, backup
job): https when the public listeners have TLS (tls.secretName), whose
certificate must then name <fullname>.<namespace>.svc.<clusterDomain>.
*/}}
{{- define "agentry.clientGrpcUrl" -}}
{{- printf "%s://%s.%s.svc.%s:%d" (ternary "https" "http" (not (empty .Values.tls.secretName))) (include "agentry.fullname" .) .Release.Namespace .Values.cluster.clusterDomain (int .Values.ports.grpc) }}
{{- end }}

{{/*
Name of the backup CronJob: "<fullname>-backup", with the full name cut to
45 characters, since the API server refuses CronJob names over 52 (its
Jobs' names add a suffix of 11).
*/}}
{{- define "agentry.backupCronJobName" -}}
{{- printf "%s-backup" (include "agentry.fullname" . | trunc 45 | trimSuffix "-") }}
{{- end }}

{{/*
Name of the backup volume claim (an existing one, or the chart's own).
*/}}
{{- define "agentry.backupClaimName" -}}
{{- if .Values.backup.persistence.existingClaim }}
{{- .Values.backup.persistence.existingClaim }}
{{- else }}
{{- printf "%s-backup" (include "agentry.fullname" .) }}
{{- end }}
{{- end }}

{{/*
Listen address for a port: <cluster.listenAddress>:<port>.
*/}}
{{- define "agentry.listen" -}}
{{- printf "%s:%d" .root.Values.cluster.listenAddress (int .port) }}
{{- end }}

{{/*
Checks values that would otherwise produce a broken cluster.
*/}}
{{- define "agentry.validate" -}}
{{- if lt (int .Values.replicas) 1 }}
{{- fail "replicas must be at least 1" }}
{{- end }}
{{- if not (has .Values.cluster.bootstrap (list "auto" "manual")) }}
{{- fail (printf "cluster.bootstrap must be \"auto\" or \"manual\", not %q" (toString .Values.cluster.bootstrap)) }}
{{- end }}
{{- if not (has .Values.logging.format (list "text" "json")) }}
{{- fail (printf "logging.format must be \"text\" or \"json\", not %q" (toString .Values.logging.format)) }}
{{- end }}
{{- if not (has .Values.podAntiAffinityPreset (list "soft" "hard" "")) }}
{{- fail (printf "podAntiAffinityPreset must be \"soft\", \"hard\" or \"\", not %q" (toString .Values.podAntiAffinityPreset)) }}
{{- end }}
{{- if and .Values.clusterAuth.tls.enabled (not (or .Values.clusterAuth.tls.secretName .Values.clusterAuth.tls.certManagerCsi.issuerName)) }}
{{- fail "clusterAuth.tls.enabled needs clusterAuth.tls.secretName or clusterAuth.tls.certManagerCsi.issuerName" }}
{{- end }}
{{- if not .Values.auth.secretKey }}
{{- fail "auth.secretKey must name the key of the admin key in the Secret" }}
{{- end }}
{{- end }}

{{/*
Renders a map of labels or annotations with every value as a string (YAML
would otherwise turn values such as "true" or "1" into other types, which
Kubernetes rejects).
*/}}
{{- define "agentry.stringMap" -}}
{{- $lines := list }}
{{- range $k, $v := . }}
{{- $lines = append $lines (printf "%s: %s" $k ($v | toString | quote)) }}
{{- end }}
{{- join "\n" $lines }}
{{- end }}
